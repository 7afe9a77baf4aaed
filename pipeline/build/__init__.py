"""``python -m pipeline.build``: the build's options, its one resolved config, the launcher and the job graph."""
