"""attnbench's harness: suites -> run specs -> executors -> records -> leaderboards."""

import warnings

# torch_geometric triggers torch's jit.script deprecation warning on import; it says nothing to our users.
warnings.filterwarnings("ignore", message=r".*torch\.jit\.script.*", category=FutureWarning)
