"""Root conftest: the plugin itself is loaded once, through its pytest11 entry point."""

pytest_plugins = ["pytester"]
