"""The patch-series manager: pristine upstream trees, patch series applied as commits, export, check.

Everything here is a thin layer over git itself and needs only the standard library, so it runs
before the virtual environment exists (`make bootstrap`).
"""
