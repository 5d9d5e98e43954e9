"""The chat app's screens: the main chat screen and its dialogs."""
