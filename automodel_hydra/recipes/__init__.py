"""Training recipes; each exposes ``train(cfg, env, should_stop) -> dict`` (see :mod:`.llm_finetune`)."""
