"""What goes over the wire, as pure codecs: the v1 and KServe v2 schemas, tensors, binary data, HTTP, gRPC.

No Ray and nothing of the replica: the codecs are unit-tested alone, and the ``serve-roles`` contract keeps
operations and the log out of them.
"""
