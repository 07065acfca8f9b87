"""The harness's driver side: the pytest process, its warm pools and the tasks it runs on them."""
