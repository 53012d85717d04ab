"""The project model: summaries of functions (what they do, per port) and the whole program
that binds calls into other modules to them. Imports `syntax` and `facts`.
"""
