"""Figures, drawn from result files only (never a model): ``pipeline`` (training, weather and
hyperspectral results), ``paper`` (the paper's figures beside the published values),
``verify`` (the verification experiment); ``common`` holds what they share."""
