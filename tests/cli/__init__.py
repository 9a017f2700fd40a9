"""Tests of the command line, the bench scripts it shares code with, and the packaging."""
