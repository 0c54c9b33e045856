"""longctx: experiments on the effective context length of long-context LMs."""
