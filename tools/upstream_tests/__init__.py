"""Upstream's own checks on the pristine pin and on the patched tree (`make upstream-tests`)."""
