"""The Hugging Face hub's offline mode as an operator sets it, before the start."""


def hub_offline(monkeypatch, offline: bool = True) -> None:
    """HF_HUB_OFFLINE in the environment (child processes, transformers) and in huggingface_hub's constants,
    which it reads once, when imported: a test sets it after that import."""
    from huggingface_hub import constants

    if offline:
        monkeypatch.setenv('HF_HUB_OFFLINE', '1')
    else:
        monkeypatch.delenv('HF_HUB_OFFLINE', raising=False)
    monkeypatch.setattr(constants, 'HF_HUB_OFFLINE', offline)
