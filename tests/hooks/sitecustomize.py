"""Start-up hook of the processes a test starts with this folder on PYTHONPATH: patches the test hooks in.

See ``precision_test_hooks``; the interpreter imports ``sitecustomize`` by this name on start-up.
"""

import precision_test_hooks

precision_test_hooks.install()
