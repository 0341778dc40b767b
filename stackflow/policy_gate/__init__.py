"""The policy gate: Rego policies that decide, between preview and apply, whether a run's
changes may go ahead (``deny``), need a person (``require_approval``) or only deserve a word
(``warn``).

- :mod:`.bundle`: a set of Rego modules, content-addressed in the state backend;
- :mod:`.rego`: what each module is (a policy, a library a policy imports), read as OPA
  reads it; a module that is neither is refused;
- :mod:`.plan_input`: the document policies read (the masked plan);
- :mod:`.engine`: OPA (built from Go modules in setup), one ``opa eval`` process per bundle
  (the project's apart from the run's), with restricted capabilities and memory;
- :mod:`.decision`: what the gate decided, as recorded in the release and in history.
"""
