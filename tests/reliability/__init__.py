"""Reliability and security tests (issue 7): crashes, member faults, bad input, invariants
under load, secrets and namespace isolation. Long ones are marked ``slow``."""
