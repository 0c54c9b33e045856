"""Lightning callbacks of a training run: checkpoints, save-on-SIGTERM, speed and the metrics file
(training.py), and the probes that run during training: f(i) (frequency.py), NIAH
(niah.py) and the teacher-forced answer loss (answer.py)."""
