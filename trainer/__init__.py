"""ALIGN trainer: models, loss, optimizer, train loop, checkpoints, configs."""
