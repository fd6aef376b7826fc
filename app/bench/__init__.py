"""Measurements a user runs on their own node before choosing a deployment's CPUs, workers and
threads (``coretrain bench-scaling``); the commands print them. They train TensorFlow in
child processes, each after its own thread plan is applied."""
