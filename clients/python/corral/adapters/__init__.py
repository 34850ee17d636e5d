"""Drop-in replacements for other frameworks' sandbox interfaces:

* :mod:`corral.adapters.open_instruct`: open-instruct's ``SandboxBackend``
  (``CorralBackend``, in place of ``DockerBackend``);
* :mod:`corral.adapters.mini_swe_agent`: mini-swe-agent's environments
  (``CorralEnvironment``, in place of ``DockerEnvironment``);
* :mod:`corral.adapters.deer_flow`: deer-flow's ``SandboxProvider`` and
  ``Sandbox`` (``CorralSandboxProvider``, in place of ``AioSandboxProvider``);
* :mod:`corral.adapters.hermes`: a terminal backend of hermes-agent
  (``TERMINAL_ENV=corral``; ``CorralEnvironment``, in place of its
  ``DockerEnvironment``). Importing it needs hermes-agent.
"""
