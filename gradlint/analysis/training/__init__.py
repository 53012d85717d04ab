"""The training-step model that rules query: accumulation, evaluation code, train/eval
timelines, freed graphs, freezing, optimizer updates, targets, gradient reads. Imports
the layers below.
"""
