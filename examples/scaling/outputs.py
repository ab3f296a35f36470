"""What the scaling scripts check before they work: files they will write (never one the project
ships, unless --force; their folders made, or only checked until every argument is), files and
programs they will need. Each failure is
one line naming the argument, and exit status 2, before anything has run. It does not lock or
reserve anything: two scripts writing one file still race."""
import os
import shlex
import shutil
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def fail(script, message):
    print(f"{script}: {message}", file=sys.stderr)
    sys.exit(2)


def shipped(path):
    """Whether `path` is a file of this source tree's: tracked by git, or (with no git to ask) an
    existing file under examples/."""
    full = os.path.realpath(path)
    if os.path.commonpath([full, REPO]) != REPO or not os.path.isfile(full):
        return False
    rel = os.path.relpath(full, REPO)
    try:
        done = subprocess.run(["git", "-C", REPO, "ls-files", "--error-unmatch", "--", rel],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if done.returncode in (0, 1):  # 1: git answered, and it is not tracked
            return done.returncode == 0
    except OSError:
        pass
    return rel.startswith("examples" + os.sep)


def out_check(script, path, force, flag="--out", instead="write elsewhere (e.g. runs/...)", make=True):
    """A file to be written: not a directory, not a shipped file unless force, and a folder it can
    go in (made here unless make is False: then call folder_make once every check has passed)."""
    if os.path.isdir(path):
        fail(script, f"{flag} {path} is a directory; name a file")
    if shipped(path) and not force:
        fail(script, f"{flag} {path} is a file the project ships ({os.path.relpath(os.path.realpath(path), REPO)}); "
                     f"{instead}, or add --force to replace it")
    folder = os.path.dirname(os.path.abspath(path))
    if make:
        folder_make(script, path, flag)
        return
    # The nearest folder that is there decides whether the rest can be made.
    there = folder
    while not os.path.exists(there):
        there = os.path.dirname(there)
    if not os.path.isdir(there):
        fail(script, f"{flag} {path}: cannot make its folder {folder} ({there} is not a directory)")
    if not os.access(there, os.W_OK | os.X_OK):
        fail(script, f"{flag} {path}: its folder {folder} cannot be made or written ({there} is not writable)")


def folder_make(script, path, flag="--out"):
    """The folder of a file to be written, made (its parents too)."""
    folder = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as e:
        fail(script, f"{flag} {path}: cannot make its folder {folder} ({e.strerror})")
    if not os.access(folder, os.W_OK):
        fail(script, f"{flag} {path}: its folder {folder} is not writable")


def file_check(script, path, flag):
    if not os.path.isfile(path):
        fail(script, f"{flag} {path} is not a file" + (" (build loom first: ./setup.sh)" if flag == "--loom" else ""))


def program_check(script, command, flag):
    """The first word of a command line names a program that is there."""
    first = shlex.split(command)[0] if shlex.split(command) else ""
    if not first or not (shutil.which(first) or (os.sep in first and os.access(first, os.X_OK))):
        fail(script, f"{flag} '{command}': '{first}' is not a program here")
