"""Model registry: a name in the config -> a Flax Linen module class."""

from __future__ import annotations

from trainer.models import bert, efficientnet, two_tower

_REGISTRY = {
    "efficientnet": efficientnet.EfficientNet,
    "bert": bert.Bert,
    "two_tower": two_tower.TwoTower,
}


def get(name: str):
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; known: {sorted(_REGISTRY)}") from None


def build(model_config, **extra):
    """Instantiates ``model_config.name`` with the config's other fields.

    ``extra`` holds what only the run knows (vocab size, compute dtype).
    """
    kwargs = dict(model_config.to_dict() if hasattr(model_config, "to_dict") else model_config)
    return get(kwargs.pop("name"))(**kwargs, **extra)
