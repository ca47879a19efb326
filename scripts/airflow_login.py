"""Give `make airflow`'s users their passwords before the API server starts, so Airflow's
simple auth manager finds them in its password file and prints none to the log.

Prints where the file is (readable by its owner only), never a password.
"""

from __future__ import annotations

import json
import os
import secrets
import string
from pathlib import Path

from airflow.api_fastapi.auth.managers.simple.simple_auth_manager import SimpleAuthManager

ALPHABET = string.ascii_letters + string.digits


def ensure_passwords() -> tuple[Path, list[str]]:
    """Add a random password for every configured user the file lacks; keep the others."""
    path = Path(SimpleAuthManager.get_generated_password_file())
    passwords: dict[str, str] = json.loads(path.read_text() or "{}") if path.exists() else {}
    users = [user.username for user in SimpleAuthManager.get_users()]
    for user in users:
        passwords.setdefault(user, "".join(secrets.choice(ALPHABET) for _ in range(20)))
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as file:
        file.write(json.dumps(passwords) + "\n")
    path.chmod(0o600)
    return path, users


if __name__ == "__main__":
    file, names = ensure_passwords()
    print(f"Airflow users {', '.join(names)}: passwords in {file} (mode 600)")
