"""``make demo`` (``python -m ops.demo``): a live fleet survives a worker being SIGKILLed.

``flows`` is the demo's flow, also what the compose and Kubernetes workers serve.
"""
