"""Operations: Prometheus metrics, the health and metrics HTTP endpoint, the Ray metrics mirror, consumer lag."""
