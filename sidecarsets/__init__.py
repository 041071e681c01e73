"""SidecarSet model, store, watches and controller.

Pure pieces (hashing, selectors, validation, the upgrade planner) sit beside the I/O pieces
(the API client, the watch loop, the controller) so that the webhook can import the model and
the store without pulling in the controller.
"""
