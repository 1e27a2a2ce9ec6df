"""The web door of the honest model: ``candor serve``'s OpenAI-compatible service.

Everything here speaks HTTP; the honest model it serves (:mod:`candor.serve`'s core) never
imports it (``tests/test_layering.py``). A request's walk: :mod:`~candor.serve.http.app` (the
routes) → :mod:`~candor.serve.http.request_checks` (the body, checked against
:mod:`~candor.serve.http.schemas`) → :mod:`~candor.serve.http.service` (the running model's
generation, admission) → the core's :class:`~candor.serve.HonestModel` → back in
:mod:`~candor.serve.http.responses` or :mod:`~candor.serve.http.streaming`, from what the
:class:`~candor.serve.HonestAnswer` carries.

- :mod:`~candor.serve.http.app`: the FastAPI application and its routes;
- :mod:`~candor.serve.http.settings`: the service's settings (``candor serve``'s options);
- :mod:`~candor.serve.http.request_checks`: bodies read, bounded and checked, errors in OpenAI's shape;
- :mod:`~candor.serve.http.schemas`: the request bodies (pydantic);
- :mod:`~candor.serve.http.service`: the running model's generations, hot reload, admission;
- :mod:`~candor.serve.http.responses` and :mod:`~candor.serve.http.streaming`: the response shapes
  and server-sent events;
- :mod:`~candor.serve.http.operations`: health, readiness, request ids, the access log, CORS, draining;
- :mod:`~candor.serve.http.prometheus_metrics`: ``/metrics``;
- :mod:`~candor.serve.http.operator_routes`, :mod:`~candor.serve.http.feedback` and
  :mod:`~candor.serve.http.record_log`: the operator's routes (feedback, reload), the drift statistic, served
  answers into the store (:mod:`candor.annotation.served_store`);
- :mod:`~candor.serve.http.api_docs` and :mod:`~candor.serve.http.playground`: ``/docs`` and the page at ``/``;
- :mod:`~candor.serve.http.server`: the listener and uvicorn;
- :mod:`~candor.serve.http.classify_server`: ``candor serve-head``, a head behind vLLM's classify API.
"""
