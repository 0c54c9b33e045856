"""Training: the LightningModule, the Trainer assembly, callbacks and logging."""
