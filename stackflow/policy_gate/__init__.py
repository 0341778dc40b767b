"""The policy gate: Rego policies that decide, between preview and apply, whether a run's
changes may go ahead (``deny``), need a person (``require_approval``) or only deserve a word
(``warn``).

- :mod:`.bundle`: a set of Rego modules, content-addressed in the state backend;
- :mod:`.plan_input`: the document policies read (the masked plan);
- :mod:`.engine`: OPA (built from Go modules in setup), run with restricted capabilities;
- :mod:`.decision`: what the gate decided, as recorded in the release and in history.
"""
