// Attachments in chat: images (attach, paste, drop), audio and short video, as the chat API's content parts.
// They are kept inside the conversation as data URLs (sent again on retry and edit, gone with it).
import { el } from "./dom.js";

export const MAX_BYTES = 6 * 1024 * 1024;   // one file as it is read; bigger images are shrunk first
const SHRINK_ABOVE = 1024 * 1024;
const LONG_SIDE = 1536;

/** Which modality a file is (image, audio, video), or null. */
export function modalityOf(type) {
  const kind = (type || "").split("/")[0];
  return ["image", "audio", "video"].includes(kind) ? kind : null;
}

const readDataURL = (blob) => new Promise((resolve, reject) => {
  const reader = new FileReader();
  reader.onload = () => resolve(reader.result);
  reader.onerror = () => reject(reader.error);
  reader.readAsDataURL(blob);
});

async function shrunk(file) {
  const bitmap = await createImageBitmap(file);
  const scale = Math.min(1, LONG_SIDE / Math.max(bitmap.width, bitmap.height));
  const canvas = el("canvas", { width: Math.round(bitmap.width * scale), height: Math.round(bitmap.height * scale) });
  canvas.getContext("2d").drawImage(bitmap, 0, 0, canvas.width, canvas.height);
  return new Promise((resolve) => canvas.toBlob(resolve, "image/jpeg", 0.9));
}

/** The content part of a file: image_url, input_audio (wav/mp3) or video_url; throws a message for people. */
export async function partOf(file) {
  const modality = modalityOf(file.type);
  if (!modality) throw new Error(`${file.name || "This file"} is not an image, audio or video file.`);
  let blob = file;
  if (modality === "image" && file.size > SHRINK_ABOVE && file.type !== "image/gif") blob = await shrunk(file);
  if (blob.size > MAX_BYTES) {
    throw new Error(`${file.name || "The file"} is ${(blob.size / 1048576).toFixed(1)} MB: at most ${MAX_BYTES / 1048576} MB.`);
  }
  const url = await readDataURL(blob);
  const name = file.name || `${modality}`;
  if (modality === "image") return { type: "image_url", image_url: { url }, name };
  if (modality === "video") return { type: "video_url", video_url: { url }, name };
  const format = /mpeg|mp3/.test(file.type) ? "mp3" : /wav/.test(file.type) ? "wav" : null;
  if (!format) throw new Error(`${name}: audio must be WAV or MP3.`);
  return { type: "input_audio", input_audio: { data: url.split(",", 2)[1], format }, name };
}

/** The modality of a stored part (or null for text). */
export function partModality(part) {
  return { image_url: "image", input_audio: "audio", video_url: "video" }[part.type] || null;
}

/** A thumbnail or player of a stored part. */
export function partView(part) {
  const name = part.name || partModality(part);
  if (part.type === "image_url") return el("img", { className: "thumb", src: part.image_url.url, alt: name, title: name });
  if (part.type === "video_url") return el("video", { className: "thumb", src: part.video_url.url, controls: true, title: name });
  if (part.type === "input_audio") {
    return el("audio", { src: `data:audio/${part.input_audio.format === "mp3" ? "mpeg" : "wav"};base64,${part.input_audio.data}`,
      controls: true, title: name });
  }
  return el("span");
}

/** The text of a message's content (a string, or the text parts of a list). */
export function textOf(content) {
  if (typeof content === "string") return content;
  if (!Array.isArray(content)) return "";
  return content.filter((p) => p.type === "text").map((p) => p.text).join("\n");
}

export const mediaParts = (content) => (Array.isArray(content) ? content.filter((p) => partModality(p)) : []);

/** Content as the chat API takes it: the page's own `name` on parts left out. */
export function apiContent(content) {
  if (!Array.isArray(content)) return content ?? null;
  return content.map(({ name, ...part }) => part);
}

/** Content of a user message: the text, with the parts after it when there are any. */
export function contentOf(text, parts) {
  if (!parts.length) return text;
  return [{ type: "text", text }, ...parts];
}
