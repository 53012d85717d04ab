"""Facts about values and objects in one module: what objects are (roles, framework
contracts), which assignment reaches a use, what calls do (gradient events), which
values carry a graph, leaves, saved tensors, shapes, dtypes, grad mode. Each module
imports only `syntax` and the facts below it.
"""
