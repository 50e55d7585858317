"""The jobs built on the engine: fuzz, drift, bench, calibration, the model level, scale-out and the results page."""
