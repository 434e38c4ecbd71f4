"""The Flower ServerApp, experiment runner, results and launch helpers."""
