"""Using a trained model: the self-describing model folder (``export``), forecasts from a
store or a user's own initial conditions (``weather``), classification maps and
reconstructions of new hyperspectral images (``hsi``)."""
