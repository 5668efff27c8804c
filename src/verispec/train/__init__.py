"""Self-distillation for head proposers: instructions the target writes itself (`prompts`),
the target's own responses with their features cached on disk (`data`), and the training loop
that fits a head to the target's next-token distribution (`loop`). `verispec train` drives them.
"""
