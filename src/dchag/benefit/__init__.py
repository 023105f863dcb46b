"""Does D-CHAG (or an alternative) pay off on a given cluster: calibration, cost model, advice."""
