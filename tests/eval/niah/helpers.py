"""Shared helpers of the NIAH tests."""


def eval_args(haystack_file):
    return [
        f"eval.niah.haystack={haystack_file}",
        "eval.niah.step=128",
        "eval.niah.tests_per_length=2",
        "eval.niah.max_new_tokens=8",
        "log.wandb_mode=disabled",
    ]
