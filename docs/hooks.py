"""mkdocs hook (mkdocs.yml: hooks): every dated note in docs/notes/ is linked from
docs/notes/index.md, the notes' one list, so that a note cannot go unlisted."""
import re

from mkdocs.exceptions import PluginError

NOTE = re.compile(r"notes/\d{4}-\d{2}-\d{2}-[\w-]+\.md$")


def on_files(files, config):
    index = files.get_file_from_path("notes/index.md")
    listed = set(re.findall(r"\]\(([^)]+\.md)\)", index.content_string))
    unlisted = sorted(f.src_uri for f in files
                      if NOTE.match(f.src_uri) and f.src_uri.split("/")[1] not in listed)
    if unlisted:
        raise PluginError(f"docs/notes/index.md does not list {', '.join(unlisted)}")
    return files
