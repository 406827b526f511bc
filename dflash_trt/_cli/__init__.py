"""One module per command group; each exposes ``register(app)``. ``cli.py`` only wires them."""
