"""Syntax: the read-only walk, dotted names and imports, what one traversal records
(scopes, loops, grad-mode contexts), forward data flow, positions, and references to
project functions.
"""
