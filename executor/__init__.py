"""Run schedule graphs on torch.distributed point-to-point (needs the `torch` extra)."""
