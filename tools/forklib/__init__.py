"""tools/fork.py's parts, by job: core (paths, the wheel, git), series (steps and what
they add), tree (materialize, import), wheel (build, install, overlay), marks (which tests
a step and a base run), probes and check (check --each), export, compare, cli."""
