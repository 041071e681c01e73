"""The sidecarctl program: the manager's composition root and the command line. Nothing imports it."""
