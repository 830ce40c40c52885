"""Tests of bursarcore.sim (a package, so its conftest is not the bare module "conftest")."""
