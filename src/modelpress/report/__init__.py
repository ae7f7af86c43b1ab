"""Records of every command as JSON, and the HTML page built from them."""
