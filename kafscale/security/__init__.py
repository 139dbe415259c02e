"""Who a client is and what it may do: listeners' security protocols, TLS, SASL mechanisms, stored credentials.

A layer below the acceptor (which runs the handshakes on its connections) and above storage (credentials live in
the metadata store). No I/O in the mechanisms themselves: they are fed bytes and answer bytes.
"""
