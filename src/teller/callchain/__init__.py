"""Call-chain trees: events → per-step, per-request trees on one clock."""
