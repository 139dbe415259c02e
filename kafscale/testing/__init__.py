"""Start real servers (etcd, S3) on 127.0.0.1 with free ports, for tests and benchmarks."""
