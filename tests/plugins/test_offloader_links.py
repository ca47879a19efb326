from offloader_airflow.links import object_browser_url


def test_links_point_at_the_object() -> None:
    assert object_browser_url("file:///data/objects", None, "u-ledger-1") == (
        "file:///data/objects/u-ledger-1"
    )
    assert object_browser_url("s3://b/p", "http://127.0.0.1:8333", "u-ledger-1") == (
        "http://127.0.0.1:8333/b/p/u-ledger-1"
    )
    assert object_browser_url("s3://b", None, "u-ledger-1") == (
        "https://s3.console.aws.amazon.com/s3/buckets/b?prefix=u-ledger-1"
    )
