# One image for every kaos-agent service in docker-compose.yml: the agents, the scripted model
# and the MCP servers (`kaos-agent serve {agent,model,mcp}`; flags or KAOS_* / OTEL_* env).
#
#   docker build -t kaos-agent .
#   docker run --rm -p 8000:8000 -e KAOS_AGENT_NAME=solo -e KAOS_MODEL_BASE_URL=http://model:8100/v1 kaos-agent
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app
COPY pyproject.toml setup.py README.md LICENSE ./
COPY kaos_otel ./kaos_otel
COPY instrumented_agent ./instrumented_agent
# the dashboards and collector configurations setup.py copies into the wheel
# (`kaos-otel collector config`, `kaos-otel dashboards export`)
COPY collector ./collector
COPY dashboards ./dashboards
RUN pip install '.[agent]' \
    && useradd --system --uid 10001 --no-create-home kaos \
    && mkdir -p /var/lib/kaos && chown 10001 /var/lib/kaos

USER 10001
# agent 8000, scripted model 8100, MCP servers 8200 (the CLI's default ports)
EXPOSE 8000 8100 8200
ENTRYPOINT ["kaos-agent"]
CMD ["serve", "agent", "--host", "0.0.0.0", "--port", "8000"]
