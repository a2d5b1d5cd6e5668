"""Running the service: admission, readiness, which ingress, Serve's sockets on loopback, ``GET /metrics``."""
