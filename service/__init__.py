"""The sessionstate service: the HTTP app (`app`) over the context it wires (`context`), and
its rooms by concern (see the README's Layout table)."""
