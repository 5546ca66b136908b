"""rlhf_lab."""
