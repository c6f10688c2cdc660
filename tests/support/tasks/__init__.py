"""Task modules used by the planning tests (the real built-in tasks come with the loop)."""
