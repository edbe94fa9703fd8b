"""Approving from Slack (README § Slack approvals).

* :mod:`cosigner.slack.blocks`: the Block Kit of a request's message and the reject modal;
* :mod:`cosigner.slack.api`: the Web API through ``slack_sdk`` (its one adapter);
* :mod:`cosigner.slack.messages`: the durable outbox that posts and updates messages;
* :mod:`cosigner.slack.links`: one-time links from a Slack user to a principal;
* :mod:`cosigner.slack.signatures`: Slack's request signatures, checked first;
* :mod:`cosigner.slack.interactions`: signed clicks → the one review function;
* :mod:`cosigner.slack.answers`: what the clicker is told, and the calls after the answer.
"""
