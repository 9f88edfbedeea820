# One image for every example service, the relay and the CLI.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY saga saga
COPY bus bus
COPY relay relay
COPY cli cli
COPY services_example services_example
COPY redsaga redsaga
# the `ui` extra: the compose file's `ui` service runs `saga ui` from this image
RUN pip install --no-cache-dir '.[ui]'
USER nobody
ENTRYPOINT []
CMD ["saga", "--help"]
