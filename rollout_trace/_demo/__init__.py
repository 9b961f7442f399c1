"""The demo behind ``rollout-trace demo``, written as a user would write it.

It imports ``rollout_trace`` as ``rt`` and nothing private of it. ``runner``
(the parent) starts a controller process (``child``) and SIGKILLs it at the
moment the seed picks, starts a second one that restores the latest snapshot,
then runs ``rollout-trace cost`` and ``rollout-trace timeline`` over the two
trace files. Each child is a ``controller.Controller`` (groups, tries,
training steps, checkpoints, snapshots: every transition an ``rt`` event)
on ``sim``'s simulated clock, traced with ``rt.tracer``; so one seed always
gives the same events and figures.
"""
